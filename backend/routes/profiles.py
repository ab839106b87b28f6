"""/api/profiles: upload (JSON or multipart), list, get, per-layer data, delete."""

from typing import Annotated

from fastapi import APIRouter, File, Form, Query, UploadFile

from pipestudio.backend.deps import Authorized, Readable, SessionDep
from pipestudio.backend.repositories import Profiles
from pipestudio.backend.schemas.common import ERRORS, PathId
from pipestudio.backend.schemas.profiles import (
    ProfileCreate,
    ProfileDetailPublic,
    ProfileLayersPublic,
    ProfilePublic,
    ProfilesPublic,
)
from pipestudio.backend.services import profiles as service
from pipestudio.planner.formats.documents import MAX_MICROBATCH_SIZE

router = APIRouter(prefix="/api/profiles", tags=["profiles"], responses=ERRORS)


@router.post("", status_code=201, dependencies=[Authorized])
def create_profile(session: SessionDep, data: ProfileCreate) -> ProfilePublic:
    """Store a profile sent as JSON: the native document or PipeDream graph.txt text."""
    return ProfilePublic.model_validate(service.create_profile(session, data))


@router.post("/upload", status_code=201, dependencies=[Authorized])
def upload_profile(
    session: SessionDep,
    file: Annotated[UploadFile, File()],
    name: Annotated[str | None, Form(max_length=200)] = None,
    batch_size: Annotated[int | None, Form(ge=1, le=MAX_MICROBATCH_SIZE)] = None,
    model: Annotated[str | None, Form(max_length=200)] = None,
) -> ProfilePublic:
    """Store an uploaded file: a Profile JSON, or a PipeDream graph.txt (anything else),
    which needs the ``batch_size`` it was profiled at."""
    data = service.parse_upload(
        file.file.read(), file.filename or "upload", name=name, batch_size=batch_size, model=model
    )
    return ProfilePublic.model_validate(service.create_profile(session, data))


@router.get("", dependencies=[Readable])
def list_profiles(
    session: SessionDep,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> ProfilesPublic:
    rows, total = Profiles(session).page(offset, limit)
    return ProfilesPublic(data=[ProfilePublic.model_validate(r) for r in rows], count=total)


@router.get("/{profile_id:int}", dependencies=[Readable])
def get_profile(session: SessionDep, profile_id: PathId) -> ProfileDetailPublic:
    return ProfileDetailPublic.model_validate(Profiles(session).get(profile_id))


@router.get("/{profile_id:int}/layers", dependencies=[Readable])
def get_layers(session: SessionDep, profile_id: PathId) -> ProfileLayersPublic:
    """Per-layer times and sizes, one array per field."""
    return service.profile_layers(Profiles(session).get(profile_id))


@router.delete("/{profile_id:int}", status_code=204, dependencies=[Authorized])
def delete_profile(session: SessionDep, profile_id: PathId) -> None:
    """Delete a profile; 409 while a plan uses it."""
    service.delete_profile(session, profile_id)
