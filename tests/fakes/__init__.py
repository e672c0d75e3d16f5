"""Fakes of Google (and other) APIs: small HTTP servers on 127.0.0.1 that accept exactly the
documented request shapes. tpu_api: Cloud TPU v2alpha1 queued resources and v2 nodes."""
