"""Storing profiles: native JSON or PipeDream graph.txt, per-layer data, guarded deletes."""

import json

from sqlalchemy.orm import Session

from pipestudio.backend import models
from pipestudio.backend.errors import InputError
from pipestudio.backend.repositories import Plans, Profiles
from pipestudio.backend.schemas.profiles import ProfileCreate, ProfileLayersPublic
from pipestudio.planner import PlannerError, Profile, parse_document, parse_pipedream


def parse_profile(data: ProfileCreate) -> tuple[Profile, str]:
    """The Profile the request describes, and its source (``json`` or ``pipedream``)."""
    if data.format == "pipedream":
        if data.graph is None:
            raise InputError("graph", "format 'pipedream' needs the graph.txt text in 'graph'")
        try:
            return parse_pipedream(data.graph, model=data.model or data.name or "pipedream",
                                   batch_size=data.batch_size), "pipedream"
        except PlannerError as exc:
            raise InputError("graph", str(exc)) from None
    if data.profile is None:
        raise InputError("profile", "format 'pipestudio' needs the Profile document in "
                                    "'profile'")
    try:
        return parse_document(Profile, data.profile, source="profile"), "json"
    except PlannerError as exc:
        raise InputError("profile", str(exc)) from None


def parse_upload(content: bytes, filename: str, *, name: str | None, batch_size: int,
                 model: str | None) -> ProfileCreate:
    """A multipart upload: JSON when it parses as a JSON object, else PipeDream text."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("file", f"{filename!r} is not UTF-8 text") from None
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if isinstance(document, dict):
        return ProfileCreate(name=name, profile=document)
    stem = filename.rsplit("/", 1)[-1].removesuffix(".txt")
    return ProfileCreate(name=name, format="pipedream", graph=text, batch_size=batch_size,
                         model=model or (stem if stem and stem != "graph" else None))


def create_profile(session: Session, data: ProfileCreate) -> models.Profile:
    profile, source = parse_profile(data)
    return Profiles(session).add(models.Profile(
        name=data.name or profile.model, model=profile.model, num_layers=profile.num_layers,
        microbatch_size=profile.microbatch_size, source=source,
        document=profile.model_dump(mode="json")))


def load_profile(row: models.Profile) -> Profile:
    return Profile.model_validate(row.document)


def profile_layers(row: models.Profile) -> ProfileLayersPublic:
    layers = load_profile(row).layers
    return ProfileLayersPublic(
        profile_id=row.id, microbatch_size=row.microbatch_size,
        name=[layer.name for layer in layers], kind=[layer.kind for layer in layers],
        **{field: [getattr(layer, field) for layer in layers]
           for field in ("fwd_ms", "bwd_ms", "update_ms", "param_bytes", "saved_bytes",
                         "output_bytes", "workspace_bytes")})


def delete_profile(session: Session, profile_id: int) -> None:
    row = Profiles(session).get(profile_id)
    Plans(session).refuse_if_used(models.Plan.profile_id, profile_id, f"profile {profile_id}")
    Profiles(session).delete(row)
