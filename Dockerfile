# gridledger: one image for the ledger and the meter agents (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md deploy/constraints.txt ./
COPY gridledger/ gridledger/
COPY proto/ proto/
COPY meter/ meter/
COPY ledger/ ledger/
COPY verifier/ verifier/
COPY transport/ transport/
COPY witness/ witness/
COPY billview/ billview/
# /var/lib/gridledger/stack is the mount point of the compose `stack` volume: created and
# owned by uid 10001 here, so a fresh named volume starts with that owner (Docker copies
# the image directory's ownership into an empty volume) and the services can write it.
# Every dependency at the version the tests ran (deploy/constraints.txt), not the newest.
RUN pip install --constraint constraints.txt . \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/gridledger gridledger \
    && mkdir -p /var/lib/gridledger/data /var/lib/gridledger/spool /var/lib/gridledger/keys \
        /var/lib/gridledger/stack \
    && chown -R 10001:10001 /var/lib/gridledger

USER gridledger
WORKDIR /var/lib/gridledger
ENTRYPOINT ["gridledger"]
CMD ["--help"]
