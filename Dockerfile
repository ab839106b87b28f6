# One image for every PipeStudio service: the backend with its dashboard (`pipestudio
# serve`), the one-shot database migration, and the worker agents (`pipestudio worker`).
# Configuration comes only from environment variables (docs/deployment.md).
#
#   docker build -t pipestudio .                                   # CPU torch (default)
#   docker build -t pipestudio-gpu \
#       --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
FROM python:3.11-slim

# Where torch comes from: the PyTorch CPU wheel index by default; a CUDA index
# (https://download.pytorch.org/whl/cuXYZ) for the image of the GPU workers.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_SPEC=torch==2.13.0

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# torch first, in its own layer: it is the largest and changes least.
RUN pip install --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"

COPY pyproject.toml README.md alembic.ini ./
COPY src ./src
COPY backend ./backend
COPY runtime ./runtime
COPY dashboard ./dashboard
COPY planner ./planner
COPY alembic ./alembic
COPY profiles ./profiles
# Editable, so that the files beside the modules (the Alembic migrations, the dashboard's
# stylesheet) are used from /app as they are in a checkout.
RUN pip install -e ".[runtime,backend,dashboard]"

# /data/checkpoints belongs to the user, so that a new volume mounted there (Compose's
# checkpoints) does too.
RUN useradd --create-home --uid 1000 pipestudio && mkdir -p /data/checkpoints \
    && chown -R pipestudio /data
USER pipestudio

# Without PostgreSQL the backend keeps a SQLite file in /data (mount a volume there).
ENV PIPESTUDIO_DATABASE_URL=sqlite:////data/pipestudio.db
EXPOSE 8000
CMD ["pipestudio", "serve", "--host", "0.0.0.0", "--port", "8000"]
