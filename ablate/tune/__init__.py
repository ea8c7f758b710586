"""Tune: Optuna studies whose trials are runs, driven through the launch scheduler; storage and dashboard.

May import: every stage below it (config ... launch).
"""
