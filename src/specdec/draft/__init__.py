"""Where proposals come from: model copies, n-gram lookup, token trees, other vocabularies.
"""
