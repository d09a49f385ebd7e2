from wtc.cli import run

run()
