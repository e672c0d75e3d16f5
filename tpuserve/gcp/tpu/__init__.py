"""The TPU API: one client (client.TpuClient) for queued resources (REST v2alpha1, the only
surface that can express flex-start) and nodes (google-cloud-tpu)."""
