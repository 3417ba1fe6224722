"""`accelgen twin`: the shipped family widened to a real model's shape (`command.py`)."""
