# isoprobe as a container: the entrypoint is `isoprobe`, run as a non-root user.
#
#   docker build -t isoprobe .
#   docker run --rm --gpus all -v "$PWD/specs:/specs:ro" -v isoprobe-cache:/cache isoprobe run resnet50.yaml
#   docker run --rm isoprobe run /opt/isoprobe/specs/small-cnn.yaml     # a shipped spec, CPU, no mount
#
# Specs: mount a folder at /specs (the working directory, so relative paths work; read-only is fine,
# a factory file next to a spec is found there). Cache: /cache is a volume, and ISOPROBE_CACHE_DIR
# points at it, so answers outlive the container. The registry's torch wheel carries its own CUDA
# libraries: the host needs only the NVIDIA driver and the NVIDIA container toolkit for --gpus.
# Without a GPU the CPU backend runs. isoprobe is PID 1 here (exec-form ENTRYPOINT, no shell):
# it forwards signals to the probe and reaps orphaned processes itself (isoprobe/system/pid1.py).
#
# BASE_IMAGE: any image with `python` (3.10+) and `pip` on PATH. The default is the official slim image;
# the container test tier builds on a stand-in made with debootstrap (tests/container/build_image.sh).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# PIP_CONSTRAINT: a constraints file pip obeys (an ARG is in RUN's environment), for an image that must hold
# the same torch as something else; the container test tier pins the host venv's torch and torchvision so
# the image tests what the host's tests test (tests/container/build_image.sh). Empty: pip resolves freely.
ARG PIP_CONSTRAINT=""

# The dependencies first, in a layer of their own: torch and its CUDA libraries are ~6 GB, and a change to
# isoprobe's code, its README or a spec rebuilds only the layers after it (seconds, not minutes, and no second
# 6 GB layer beside the first). They are installed as a stand-in package's (pyproject.toml's dependencies
# under the project's name, with an empty module), which is then uninstalled; the project follows.
WORKDIR /opt/isoprobe
COPY pyproject.toml ./
RUN mkdir isoprobe && touch isoprobe/__init__.py README.md \
    && pip install . && pip uninstall --yes isoprobe \
    && rm -rf isoprobe README.md build isoprobe.egg-info
COPY README.md ./
COPY isoprobe ./isoprobe
RUN pip install . && isoprobe --version
COPY specs ./specs

# A fixed uid (1000) so that files written to a bind-mounted cache belong to a predictable owner;
# /cache is created and chowned before VOLUME, so a fresh named volume starts writable for it.
RUN groupadd --gid 1000 isoprobe \
    && useradd --uid 1000 --gid isoprobe --create-home --shell /usr/sbin/nologin isoprobe \
    && mkdir -p /specs /cache \
    && chown isoprobe:isoprobe /specs /cache
ENV ISOPROBE_CACHE_DIR=/cache
VOLUME ["/cache"]

USER 1000:1000
WORKDIR /specs
ENTRYPOINT ["isoprobe"]
CMD ["--help"]
