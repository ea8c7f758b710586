"""Report: figures (PNG + SVG/PDF + the CSV behind each) from a sweep's tidy tables.

May import: every stage below it (config ... tune).
"""
