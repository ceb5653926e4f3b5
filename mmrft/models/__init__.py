"""Model-family adapters (registered with ``@model_family``) and tiny-model builders."""
