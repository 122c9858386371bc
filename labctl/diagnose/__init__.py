"""What makes distributed runs hang, found in seconds: doctor's checks and the trap scenarios."""
