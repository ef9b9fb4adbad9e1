"""child"""
