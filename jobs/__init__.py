"""Ray jobs: streamed ingestion (``python -m jobs.ingest``), submitted with ``ray job submit``.

This package is the Ray layer over the core's ingestion parsing (``cortex_ray.knowledge``) and
its store (``KnowledgeWriter``); the core never imports it.
"""
