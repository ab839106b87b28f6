"""The published JSON Schemas of the documents (``pipestudio schema NAME``)."""

from typing import Any

from pipestudio.planner.formats.cluster import Cluster
from pipestudio.planner.formats.documents import Document
from pipestudio.planner.formats.plan import Plan
from pipestudio.planner.formats.profile import Profile
from pipestudio.planner.formats.proposal import Proposal
from pipestudio.planner.formats.result import SimResult

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
