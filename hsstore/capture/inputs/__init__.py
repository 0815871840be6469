"""Rows to samples: manifest, data files, chat rendering, loss masks, tokenizing."""
