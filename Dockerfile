FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 VAR_DIR=/app/var
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends gettext && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml ./
COPY . .
RUN pip install --no-cache-dir . && useradd -m app && mkdir -p var && chown -R app var
USER app
EXPOSE 8000
