# isoprobe as a container entrypoint: `docker run --gpus all IMAGE run /specs/resnet50.yaml`.
# The registry's torch wheel carries its own CUDA libraries; the host needs only the NVIDIA driver
# (and the NVIDIA container toolkit for --gpus). Without a GPU the CPU backend runs.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/isoprobe
COPY pyproject.toml README.md ./
COPY isoprobe ./isoprobe
COPY specs ./specs
RUN pip install . && isoprobe --version

WORKDIR /work
ENTRYPOINT ["isoprobe"]
CMD ["--help"]
