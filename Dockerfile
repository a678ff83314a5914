# The agent image (the engine runs inside it, supervised by the agent).
# Official base image only; the install steps are scripts/setup.sh, the same ones the
# README's `make setup` runs on a bare Debian host.
FROM python:3.11-slim

WORKDIR /opt/inferd
COPY . .
RUN scripts/setup.sh && rm -rf /var/lib/apt/lists/* /root/.cache/pip

ENV PATH=/opt/inferd/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1
EXPOSE 8000 9400
CMD ["inferd", "agent"]
