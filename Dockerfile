# kubetrain's images (not built in CI: the build machines have no container engine;
# tests/unit/test_deploy.py checks what it can without one).
#
#   docker build -t kubetrain:0.1.0 .                   the server (deploy/base runs it)
#   docker build --target runtime -t kubetrain-runtime .  a base layer for training images
#
# Training images that have their own base install the package instead:
#   pip install --no-deps kubetrain   (the runtime side needs only the standard library)

FROM python:3.11-slim-bookworm AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# A training base: kubetrain's package without the server's dependencies.
FROM python:3.11-slim-bookworm AS runtime
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir --no-deps /wheels/*.whl && rm -rf /wheels \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin kubetrain
USER 10001:10001

# The server: the locked dependencies (hash-checked), then kubetrain itself.
FROM python:3.11-slim-bookworm AS server
COPY requirements.lock /tmp/requirements.lock
RUN pip install --no-cache-dir --require-hashes --no-deps -r /tmp/requirements.lock \
    && rm /tmp/requirements.lock
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir --no-deps /wheels/*.whl && rm -rf /wheels \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin kubetrain
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["kubetrain"]
CMD ["serve", "--host", "0.0.0.0"]
