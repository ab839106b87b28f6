"""The documents: Profile, Cluster, Plan, SimResult and Proposal, their shared
machinery (bounded fields, loading, readable errors), the published JSON Schemas, and the
import of PipeDream's profiles."""
