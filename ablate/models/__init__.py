"""Models: where an encoder comes from (sources) and where each family keeps its parts (families).

May import: config.
"""
