"""The `kubetrain` command: main.py parses and has the last word on errors; commands.py
registers every command's arguments (standard library only); each module here is
one command's handlers, imported when that command runs."""
