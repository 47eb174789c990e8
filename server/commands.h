// commands: the moeserve subcommands. Each lives in server/cmd_<name>.c and
// returns a process exit status (0 ok, 1 runtime error, 2 usage error).
#ifndef MOESERVE_SERVER_COMMANDS_H
#define MOESERVE_SERVER_COMMANDS_H

int cmd_bench(int argc, char **argv);
int cmd_bench_offline(int argc, char **argv);
int cmd_chat_template(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_make_model(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_version(int argc, char **argv);

#endif
