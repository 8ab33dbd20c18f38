"""The customer's workbench on the storefront side (rental.workbench): their own image or an
operator template, environment variables and secrets (per lease and per account), registry
credentials, and published ports. Star-imported by storefront/settings/__init__.py. Every
limit is here so an operator can tighten it without a code change; the node agent has its
own (nodeagent/config.py) and refuses what exceeds them too."""
import os

from .env import env_list

# Container ports one lease may publish (each with its own source CIDRs).
WORKBENCH_MAX_PORTS = int(os.environ.get("WORKBENCH_MAX_PORTS", "5"))
# Source CIDRs one published port may list.
WORKBENCH_MAX_CIDRS_PER_PORT = int(os.environ.get("WORKBENCH_MAX_CIDRS_PER_PORT", "16"))
# Variables and secrets one lease may carry together (after the account's are added).
WORKBENCH_MAX_ENV = int(os.environ.get("WORKBENCH_MAX_ENV", "64"))
# The longest variable name, and the largest value, in bytes (UTF-8).
WORKBENCH_MAX_ENV_NAME_LENGTH = int(os.environ.get("WORKBENCH_MAX_ENV_NAME_LENGTH", "128"))
WORKBENCH_MAX_ENV_VALUE_BYTES = int(os.environ.get("WORKBENCH_MAX_ENV_VALUE_BYTES", "4096"))
# All names and values of one lease (or one account) together, in bytes: what the node's
# desired state carries for the lease stays small.
WORKBENCH_MAX_ENV_TOTAL_BYTES = int(os.environ.get("WORKBENCH_MAX_ENV_TOTAL_BYTES", "32768"))
# The start command, in bytes.
WORKBENCH_MAX_START_COMMAND_BYTES = int(os.environ.get("WORKBENCH_MAX_START_COMMAND_BYTES", "4096"))
# The largest image (uncompressed) a node pulls for a lease; sent to the node as image_max_bytes.
WORKBENCH_IMAGE_MAX_GB = int(os.environ.get("WORKBENCH_IMAGE_MAX_GB", "64"))
# Registry credentials and account variables (with secrets) one account may keep.
WORKBENCH_MAX_REGISTRY_CREDENTIALS = int(os.environ.get("WORKBENCH_MAX_REGISTRY_CREDENTIALS", "20"))
WORKBENCH_MAX_ACCOUNT_VARIABLES = int(os.environ.get("WORKBENCH_MAX_ACCOUNT_VARIABLES", "64"))
# A registry password or token, in bytes.
WORKBENCH_MAX_REGISTRY_PASSWORD_BYTES = int(os.environ.get("WORKBENCH_MAX_REGISTRY_PASSWORD_BYTES", "4096"))
# Names the instance sets itself (or that change how every program in it runs): refused as
# variable names, with anything starting with one of the prefixes.
WORKBENCH_RESERVED_ENV_NAMES = env_list(
    "WORKBENCH_RESERVED_ENV_NAMES",
    "PATH,HOME,HOSTNAME,USER,SHELL,TERM,PWD,LD_PRELOAD,LD_LIBRARY_PATH,CUDA_VISIBLE_DEVICES,"
    "ROCR_VISIBLE_DEVICES,HIP_VISIBLE_DEVICES,GPU_DEVICE_ORDINAL")
WORKBENCH_RESERVED_ENV_PREFIXES = env_list("WORKBENCH_RESERVED_ENV_PREFIXES", "NVIDIA_,GPU_RENT_,SSH_")
# Bytes of randomness of a secret a template generates for each lease (the Jupyter token).
WORKBENCH_GENERATED_SECRET_BYTES = int(os.environ.get("WORKBENCH_GENERATED_SECRET_BYTES", "24"))

# --- teams (ADR 0017): members of an account with roles
# An invitation link works this many days, once.
WORKBENCH_TEAM_INVITE_DAYS = int(os.environ.get("WORKBENCH_TEAM_INVITE_DAYS", "7"))
# Members plus pending invitations per account: a bound on what one account can make us mail.
WORKBENCH_TEAM_MAX_MEMBERS = int(os.environ.get("WORKBENCH_TEAM_MAX_MEMBERS", "50"))

# --- GPU telemetry (fleet/telemetry.py, nodeagent/PROTOCOL.md "Telemetry", docs/adr/0016) ---
# A sample older than this (an agent back after a long outage) or in the future is refused.
WORKBENCH_TELEMETRY_MAX_AGE_DAYS = int(os.environ.get("WORKBENCH_TELEMETRY_MAX_AGE_DAYS", "14"))
# The idle notice: every card of an active lease under this utilisation (%) for this long.
WORKBENCH_IDLE_UTIL_PERCENT = int(os.environ.get("WORKBENCH_IDLE_UTIL_PERCENT", "5"))
WORKBENCH_IDLE_HOURS = int(os.environ.get("WORKBENCH_IDLE_HOURS", "24"))
# How often the idle check runs (a beat job); under WORKBENCH_IDLE_HOURS, so no busy stretch
# between two checks goes unseen.
WORKBENCH_IDLE_CHECK_SECONDS = float(os.environ.get("WORKBENCH_IDLE_CHECK_SECONDS", "3600"))
# The lease page's charts: the last this many hours, averaged over this many minutes a point.
WORKBENCH_CHART_HOURS = int(os.environ.get("WORKBENCH_CHART_HOURS", "24"))
WORKBENCH_CHART_STEP_MINUTES = int(os.environ.get("WORKBENCH_CHART_STEP_MINUTES", "10"))
