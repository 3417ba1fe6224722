"""What the driver and the actor both use: storage, model files and kinds, the output contract, config sections."""
