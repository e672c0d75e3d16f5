"""Fakes of Google (and other) APIs: small HTTP servers on 127.0.0.1 that accept exactly the
documented request shapes. Each fake of a Google REST API (tpu_api, storage, secretmanager,
cloud_tasks, iam) checks its requests and answers against Google's discovery document
(discovery.py, the documents google-api-python-client ships); the metadata server has no
document and keeps its shapes by hand (metadata.py)."""
