"""Storing profiles: native JSON or PipeDream graph.txt, per-layer data, guarded deletes."""

import json

from sqlalchemy.orm import Session

from pipestudio.backend import models
from pipestudio.backend.errors import InputError
from pipestudio.backend.inputs import find_unstorable, text_problem
from pipestudio.backend.repositories import Plans, Profiles
from pipestudio.backend.schemas.profiles import (
    AnyProfileCreate,
    PipeDreamGraph,
    ProfileDocument,
    ProfileLayersPublic,
)
from pipestudio.planner import PlannerError, Profile, parse_document, parse_pipedream


def parse_profile(data: AnyProfileCreate) -> tuple[Profile, str]:
    """The Profile the request describes, and its source (``json`` or ``pipedream``)."""
    if isinstance(data, ProfileDocument):
        return data.profile, "json"
    try:
        return parse_pipedream(
            data.graph, model=data.model or data.name or "pipedream", batch_size=data.batch_size
        ), "pipedream"
    except PlannerError as exc:
        raise InputError("graph", str(exc)) from None


def parse_upload(
    content: bytes, filename: str, *, name: str | None, batch_size: int | None, model: str | None
) -> AnyProfileCreate:
    """A multipart upload: JSON when it parses as a JSON object, else PipeDream text."""
    problem = text_problem(filename)
    if problem:  # it names the profile's model when nothing else does
        raise InputError("file", f"the file's name {problem}")
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("file", f"{filename!r} is not UTF-8 text") from None
    for field, value in (("file", text), ("name", name or ""), ("model", model or "")):
        problem = text_problem(value)
        if problem:
            raise InputError(field, f"{field} {problem}")
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        document = None
    if isinstance(document, dict):
        found = find_unstorable(document)
        if found is not None:
            raise InputError(".".join(["file", *map(str, found[0])]), found[1])
        try:
            return ProfileDocument(
                name=name, profile=parse_document(Profile, document, source=filename)
            )
        except PlannerError as exc:
            raise InputError("file", str(exc)) from None
    stem = filename.rsplit("/", 1)[-1].removesuffix(".txt")
    if not text.strip():
        raise InputError("file", f"{filename!r} is empty")
    if batch_size is None:
        raise InputError(
            "batch_size",
            f"{filename!r} is a PipeDream graph, which does not "
            "say the minibatch size it was profiled at: give it as batch_size",
        )
    return PipeDreamGraph(
        name=name,
        format="pipedream",
        graph=text,
        batch_size=batch_size,
        model=model or (stem[:200] if stem and stem != "graph" else None),
    )


def create_profile(session: Session, data: AnyProfileCreate) -> models.Profile:
    profile, source = parse_profile(data)
    return Profiles(session).add(
        models.Profile(
            name=data.name or profile.model,
            model=profile.model,
            num_layers=profile.num_layers,
            microbatch_size=profile.microbatch_size,
            precision=profile.precision,
            source=source,
            document=profile.model_dump(mode="json"),
        )
    )


def load_profile(row: models.Profile) -> Profile:
    return Profile.model_validate(row.document)


def profile_layers(row: models.Profile) -> ProfileLayersPublic:
    layers = load_profile(row).layers
    return ProfileLayersPublic(
        profile_id=row.id,
        microbatch_size=row.microbatch_size,
        name=[layer.name for layer in layers],
        kind=[layer.kind for layer in layers],
        **{
            field: [getattr(layer, field) for layer in layers]
            for field in (
                "fwd_ms",
                "bwd_ms",
                "update_ms",
                "param_bytes",
                "saved_bytes",
                "output_bytes",
                "workspace_bytes",
            )
        },
    )


def delete_profile(session: Session, profile_id: int) -> None:
    row = Profiles(session).get(profile_id, for_update=True)
    Plans(session).refuse_if_used(models.Plan.profile_id, profile_id, f"profile {profile_id}")
    Profiles(session).delete(row)
