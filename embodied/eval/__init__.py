"""The benchmark harness: fixed protocol, parallel evaluation, intervals, videos, reports."""
