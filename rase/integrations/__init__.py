"""Adapters that run rase inside other serving stacks. Each imports its stack only when used
(`rase.integrations.ray_serve` needs `pip install 'rase[ray]'`); nothing here is imported by
`rase` itself."""
