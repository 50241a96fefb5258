"""Acceptance rules: token level and block verification for chains, tree rules and traversal for trees.
"""
