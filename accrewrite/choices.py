"""The command line's fixed choices, kept apart from the modules that act on them so that
parsing the command line (and ``--version``) imports neither libcst nor the rules."""

FORMATS = ("concise", "full", "text", "json", "github", "gitlab", "sarif")  # migrate --output-format
PARALLEL_KINDS = ("fsdp", "tp", "fsdp,tp")  # migrate --parallel
ORIGINAL = "original"  # verify: the side that runs the script as it is
