"""The built-in reference target: a plain PyTorch loop over torchdata's StatefulDataLoader."""
