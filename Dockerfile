# The writ image: the `writ` command (dist/, built in the first stage) and its production dependencies.
# Owners run `writ owner --tools /tools/tools.js` with the tools module mounted at /tools; `writ topics ensure`
# creates the topics. examples/ is not in the image: docker-compose.yml's `demo` profile mounts
# examples/compose (the demo tools as plain JavaScript) at /tools.

FROM node:24-slim AS build
WORKDIR /app
COPY package.json package-lock.json tsconfig.json tsconfig.build.json ./
# npm install, not npm ci: the lock file lacks a Windows-only optional dependency of vite that the registry here does
# not serve. --ignore-scripts: the prepare script builds, which needs the sources copied below (and the `node`
# devDependency would fetch a second Node); the build runs on the image's node instead.
RUN npm install --no-audit --no-fund --ignore-scripts
COPY scripts/build.mjs ./scripts/build.mjs
COPY src ./src
COPY producers ./producers
# `npm run build`'s script: tsc, then the console's page (src/console/assets) copied beside its server code.
RUN node scripts/build.mjs

FROM node:24-slim
WORKDIR /app
ENV NODE_ENV=production
COPY package.json package-lock.json ./
RUN npm install --omit=dev --no-audit --no-fund --ignore-scripts
COPY --from=build /app/dist ./dist
COPY schemas ./schemas
# `writ` on the PATH; and `import ... from "writ"` (and from its dependencies, e.g. "zod") in a tools module mounted
# anywhere: Node looks for node_modules in the module's folder and each parent, so /tools/tools.js finds /node_modules.
RUN chmod +x dist/src/cli/main.js \
 && ln -s /app/dist/src/cli/main.js /usr/local/bin/writ \
 && ln -s /app /app/node_modules/writ \
 && ln -s /app/node_modules /node_modules
USER node
CMD ["writ", "owner", "--tools", "/tools/tools.js"]
