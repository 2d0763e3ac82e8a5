"""Sample-quality metrics (FID, KID, IS) and their feature extractors, and bits/dim; nothing of training."""
