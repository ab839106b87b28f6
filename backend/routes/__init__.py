"""One router per resource; routes only translate HTTP to service calls."""
