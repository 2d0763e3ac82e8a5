"""Sample-quality metrics and their feature extractors; nothing of training."""
