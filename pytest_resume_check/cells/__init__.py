"""cells"""
