"""Running a stage's work: its layers' forward and backward under the memory policies
(``stage``), activations and gradients between stages (``transport``), swapped tensors
(``swap``), weight versions under ``pipedream`` (``weights``), the gradient all-reduce
among a stage's replicas (``replicas``) and fp16's loss scaling (``scaling``)."""
