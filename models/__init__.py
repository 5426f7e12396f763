"""The pair registry as package data (``edgespec.registry``); see pairs.toml."""
