"""The published JSON Schemas of the documents (``pipestudio schema NAME``)."""

from typing import Any

from pipestudio.planner.cluster import Cluster
from pipestudio.planner.documents import Document
from pipestudio.planner.plan import Plan
from pipestudio.planner.profile import Profile
from pipestudio.planner.proposal import Proposal
from pipestudio.planner.result import SimResult

DOCUMENTS: dict[str, type[Document]] = {
    "profile": Profile,
    "cluster": Cluster,
    "plan": Plan,
    "simresult": SimResult,
    "proposal": Proposal,
}


def json_schema(name: str) -> dict[str, Any]:
    model = DOCUMENTS[name]
    schema = model.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"urn:pipestudio:schema:{name}:{model.model_fields['version'].default}"
    return schema
