from .stats import RequestStats, peak_rss_mb

__all__ = ["RequestStats", "peak_rss_mb"]
