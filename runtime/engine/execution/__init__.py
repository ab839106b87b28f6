"""Running a stage's work: its layers' forward and backward under the memory policies
(``stage``), activations and gradients between stages (``transport``), swapped tensors
(``swap``), weight versions under ``pipedream`` (``weights``), the gradient all-reduce
among a stage's replicas (``replicas``), fp16's loss scaling (``scaling``) and the data of
the next forwards, drawn while the rank waits for a peer (``data``)."""
