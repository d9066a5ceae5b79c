"""Rules only the torchtpu target runs (TorchTPU, DESIGN.md section 10)."""
