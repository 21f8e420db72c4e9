"""Over-the-air deploys: signed releases and rollback orders, keys, staging, the crash-safe
state, statuses, and the operator's publisher (``edgeinfer deploy``)."""
