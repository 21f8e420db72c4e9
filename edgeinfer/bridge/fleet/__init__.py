"""Fleets: what every device serves (``inventory``) and staged rollouts with a stop rule
(``rollout``), carried by the broker alone; progress persisted on the operator's side."""
