# CI's build of the compose file's `mher/flower:2.0` (CI reaches no image registry): Flower 2.0
# from the package index in a virtualenv, run by an unprivileged user as the official image is.
# (packaging: kombu 5.7's Redis transport imports it without declaring it.)
ARG BASE_IMAGE=pdppo-ci-base:bookworm
FROM ${BASE_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python3 -m venv /opt/venv \
    && pip install "flower==2.0.1" "redis>=5" packaging \
    && useradd --create-home flower
USER flower
EXPOSE 5555
CMD ["celery", "flower"]
