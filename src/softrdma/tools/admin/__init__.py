"""Administration: link, stats, res, ipoib."""
