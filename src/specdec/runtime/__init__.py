"""The model runtime: models with their KV caches, attention masks, loading, offline assets, timers.
"""
