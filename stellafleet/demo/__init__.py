"""`stella demo`: the scratch repository (scaffold), the simulated worker (worker), the tour (tour)."""
