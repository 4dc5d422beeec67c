"""Views stage: named subsets of the curated dataset (params.yaml `views:`) as small files beside the overlay."""
