"""What a valid stack will need and cost, before anything is created: peak GPU memory,
duration, cost, and the run plan that derives every timeout from them once."""
