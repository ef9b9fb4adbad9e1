"""The Agent Lightning VERL trainer piece: async training inputs that survive checkpoint and resume.

Only :mod:`agentlightning.verl` ships in this distribution. It shares its import name with the
upstream Agent Lightning distribution, so the two must not be installed in one environment.
Importing this package imports neither torch nor verl.
"""
