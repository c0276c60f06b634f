#!/bin/sh
echo "coverage is not available in this offline build" >&2
exit 1
