"""Draft training: target features, the EAGLE-3 training-time-test loss + signal losses, one train_step."""
