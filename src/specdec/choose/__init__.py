"""Choosing how much to draft and which draft: cost models, the rule factory, online choice.
"""
