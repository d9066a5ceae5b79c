"""Mixed precision and optimizers (XLA2xx): autocast, the gradient scaler, syncfree optimizers, the optimizer step."""
